python manage.py makemigrations library
python manage.py migrate
